"""The migration function: applies ``lambda_writer/migrations`` at deploy time."""
