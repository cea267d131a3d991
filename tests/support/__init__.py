"""Shared test support: fakes, constants, servers, reference decoders."""
