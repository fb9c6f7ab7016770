"""Importable workers for tests/test_launch.py (spawned children import them by module and name)."""
