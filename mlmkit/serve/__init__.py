"""`mlmkit serve`: the model queues (queue.py), the FastAPI app (app.py), the routes by API and their
registry (routes.py, openai.py, rerank.py, tei.py, search.py) with their request and response models
(schemas.py), the uvicorn lifecycle (server.py)."""
