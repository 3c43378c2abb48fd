"""Project-owned hardware data of the simulator (YAML); a package so wheels ship it."""
