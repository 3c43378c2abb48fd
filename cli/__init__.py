"""The composition root: the ``gpudra`` console script. May import every layer; none imports it."""
