"""Plain, JSON-able data at the bottom of the house: artifacts, candidates, measurements, results, the Triton platform table.

Records import nothing above them (only errors, vocab and settings), so every layer can read them.
"""
