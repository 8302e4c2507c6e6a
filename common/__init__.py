"""Foundation helpers shared by every component (the foundation layer of docs/architecture.md).

Owns: bearer-token credentials (`common.credentials`): digests on the server side, tokens on the
client side, the FastAPI dependency that authenticates a request.
Must never: import anything of the project (every other package may import it, so an import of
a component here would turn the layering upside down), hold a token in source, or log one.
"""
