"""The certificate keeper (``qos-extender certs``): our own process makes and rotates every certificate the
parts mount, so an install needs no hand-made Secret (issue 31). Decisions: extender.core.certs."""
