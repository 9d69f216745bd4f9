"""The rollout flag: which transport carries workflow events (``WORKFLOW_EVENT_TRANSPORT``)."""

from __future__ import annotations

from flask import Flask, current_app

from api.configs import AppConfig
from api.core.app.apps.event_transport import BroadcastEventTransport, DurableEventTransport, WorkflowEventTransport
from api.extensions.ext_durable_stream import durable_stream
from api.libs.resume_token import ResumeTokenCodec, development_key, parse_keys


def init_app(app: Flask, config: AppConfig) -> None:
    if config.WORKFLOW_EVENT_TRANSPORT == "broadcast_channel" and not config.REDIS_URL:
        raise RuntimeError("WORKFLOW_EVENT_TRANSPORT=broadcast_channel needs REDIS_URL")
    app.extensions["event_bus"] = config.WORKFLOW_EVENT_TRANSPORT
    keys = parse_keys(config.RESUME_TOKEN_KEYS) or [development_key(config.SECRET_KEY)]
    app.extensions["resume_tokens"] = ResumeTokenCodec(keys)


def event_transport() -> WorkflowEventTransport:
    config: AppConfig = current_app.config["APP_CONFIG"]
    if config.WORKFLOW_EVENT_TRANSPORT == "durable_stream":
        return DurableEventTransport(durable_stream())
    from api.core.broadcast_channel import create_broadcast_channel

    channel = current_app.extensions.get("broadcast_channel")
    if channel is None:
        channel = create_broadcast_channel(current_app.extensions["redis"], config.BROADCAST_CHANNEL_TYPE)
        current_app.extensions["broadcast_channel"] = channel
    return BroadcastEventTransport(channel)
