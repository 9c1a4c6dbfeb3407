"""Tests of miniray (a package so test modules get unique names)."""
