"""The pieces of ``deploy.py``: one module per concern, each command a small function.

``common`` (clients, names, errors), ``variant`` (pure decisions on the endpoint config:
AMI, volume, async), ``artifact`` (model.tar.gz), ``endpoint`` (deploy, update, cleanup,
delete, invoke), ``scaling`` (application-autoscaling). ``deploy.py`` only parses the
command line and dispatches through its command table, so a new subcommand is one
module with ``add_arguments(parser)`` and ``run(args, clients)`` plus one row there.
"""
