"""Maintainer tools run from the checkout (`python -m tools.<name>`); not part of the product."""
