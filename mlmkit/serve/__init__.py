"""`mlmkit serve`: the model queues (queue.py), the FastAPI app (app.py), the uvicorn lifecycle (server.py)."""
