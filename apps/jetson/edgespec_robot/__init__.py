"""edgespec on a robot: natural-language commands in, JSON actions out (see apps/jetson/README.md)."""
