"""Redis-backed broadcast channels.

Build them with :func:`api.core.broadcast_channel.create_broadcast_channel`; the modules here are
private. Each variant module opens with a capability card stating what it guarantees.
"""
