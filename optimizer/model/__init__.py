"""What is being optimized: the model source, its signature and its samples."""
