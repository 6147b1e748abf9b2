"""The CDK app's constructs. Kept import-light: ``infra.constants`` is used without aws_cdk."""
