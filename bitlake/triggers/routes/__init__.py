"""The service's HTTP routes, one router per resource; :func:`bitlake.triggers.service.create_app` includes them.

- :mod:`~bitlake.triggers.routes.health`: ``GET /health``, without a token.
- :mod:`~bitlake.triggers.routes.events`: ``POST /events`` (producers) and ``GET /events`` (consumers).
- :mod:`~bitlake.triggers.routes.triggers`: ``POST /triggers/partition``, ``/triggers/snapshot`` and
  ``/triggers/snapshot/ack`` (consumers).

A route gets what it needs from :mod:`~bitlake.triggers.routes.deps` (the caller's token with its role checked,
the app's store calls) and answers through :mod:`~bitlake.triggers.routes.responses`.
"""

from bitlake.triggers.routes import events, health, triggers

# In this order: the OpenAPI description lists the paths as the app's routes hold them.
ROUTERS = (health.router, events.router, triggers.router)
