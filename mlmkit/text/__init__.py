"""Text in: readers of every data format, records, tokenizers, length buckets. No torch."""
