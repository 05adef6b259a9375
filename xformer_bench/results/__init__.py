"""Run records (one JSON per run) and what is made from them."""
