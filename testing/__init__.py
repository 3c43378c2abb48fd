"""Test doubles that ship with gpudra (as httpx ships ``MockTransport``): an API-server
stand-in and a kubelet emulator. The demo and the test suite both use them."""
