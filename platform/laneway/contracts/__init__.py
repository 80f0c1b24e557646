"""The floor everyone may import (L0): error codes, the errors clients see, and the names the
layers share on an ASGI scope. Nothing here imports the rest of laneway."""
