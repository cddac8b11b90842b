"""Test helpers live in ``tests/helpers`` (``from helpers import node_model, save``)."""
