"""HTTP handlers, one module per resource; each exports its OPERATIONS."""
