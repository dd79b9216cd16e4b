"""Text conventions shared by the exporters and the server: the byte-level alphabet, chat
templates, special (end-of-generation, FIM) tokens. Imports only ditto_core.base."""
