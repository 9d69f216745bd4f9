"""NATS JetStream adapter (``nats://``, ``tls://``).

Card to be written.
"""
