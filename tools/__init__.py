"""Project tools (documentation generators); not part of the application package."""
