"""Test support shipped with autotune: the algorithm conformance suite, usable by plugins' tests."""

from __future__ import annotations
