"""The local stand-in for AWS: SQS emulator servers, the Lambda event-source emulation, a throwaway
PostgreSQL and the harness that wires them into one pipeline. Never imported by ``ops``."""
