"""The Ditto model file: its on-disk format (mirror of native/model/ditto_format.h), the codebook
payloads, reading/writing/validating a file, and the summary ``ditto inspect`` prints."""
