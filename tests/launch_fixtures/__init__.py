"""Importable workers for tests/devices/test_launch.py (spawned children import them by module and name)."""
