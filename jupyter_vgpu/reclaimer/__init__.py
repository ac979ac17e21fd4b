"""Give idle GPU shares back: the ``jupyter-vgpu reclaimer`` JupyterHub service.

policy.py (pure: when a share is idle or hoarded, warned, postponed, reclaimed), nodes.py
(usage from the node daemons' scrape listeners), hubapi.py (the Hub REST API), record.py
(Events, counters), service.py (the passes and the service's own API), hubconfig.py
(``configure_reclaimer(c)`` for jupyterhub_config.py).
"""
