"""Mixins shared by tune strategies."""
