"""HTTP every service shares: the OpenAI API's shapes (oai, pure), aiohttp apps inside a service's loop (server)."""
