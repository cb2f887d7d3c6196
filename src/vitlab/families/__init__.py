"""The research systems of vitlab, each a package that declares itself once as a ``vitlab.family.Family``.

Families import the core and never each other; the core finds them through ``vitlab.family``.
"""
