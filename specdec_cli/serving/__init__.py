"""Export to serving engines (one module per engine) and the endpoint client."""
