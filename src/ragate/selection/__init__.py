"""Evidence selection: which queries to search with and which retrieved documents to keep."""
