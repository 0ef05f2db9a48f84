"""The Triton side: config.pbtxt from templates and Triton's rules, atomic publishing, local server, validation."""
