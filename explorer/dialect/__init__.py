"""The ``scan`` dialect (IRDL, loaded at run time): see :mod:`explorer.dialect.scan`."""
