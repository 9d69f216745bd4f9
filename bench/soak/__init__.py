"""A fault harness for the served app: real processes, real faults, figures.

``python -m bench.soak`` (``make soak``) runs five scenarios against gunicorn ``-k gevent`` servers
and Celery workers (``--pool threads``), each on its own settings and stores, prints one markdown
table per scenario and writes every figure to ``bench/results/soak-<date>.json``:

1. ``storm``: clients drop and resume at random points, on SQLite, Redis and PostgreSQL durable
   streams, beside the live-only broadcast channel (:mod:`.storm`);
2. ``celery-kill``: a Celery worker holding started and prefetched runs is killed (:mod:`.celery_kill`);
3. ``api-kill``: a gunicorn worker is killed under streaming clients (:mod:`.api_kill`);
4. ``store-restart``: the stream store is killed and restarted mid-run and at runs' ends (:mod:`.store_restart`);
5. ``slow-client``: a client that stops reading for a minute (:mod:`.slow_client`).

``tests/app/test_soak_smoke.py`` runs scenarios 1 to 3 through the same code with small numbers.
"""
