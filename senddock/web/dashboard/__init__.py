"""The web dashboard of `senddock serve` (/dashboard/): campaigns and their progress, pause,
resume and cancel, for the one operator account of ``serve.admin``.

Nothing is imported here: importing a page module loads the web stack.
:func:`senddock.web.dashboard.routes.dashboard_routes` builds the routes.
"""
