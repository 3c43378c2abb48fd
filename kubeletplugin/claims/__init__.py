"""Claim handling: fetching a claim, checking and decoding it, preparing it."""
