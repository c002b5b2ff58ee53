"""Training text for the locally built chat tokenizers (a package so the *.txt files ship)."""
