"""The app database's SQLAlchemy object, shared by the models and the extension that configures it.

It lives with the models (as in Dify) so that a model never imports an extension:
``api.extensions.ext_database`` imports it from here and binds it to the Flask app.
"""

from __future__ import annotations

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)

__all__ = ["Base", "db"]
