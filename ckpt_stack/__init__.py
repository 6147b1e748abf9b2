"""The deployed stack's settings: the CDK context's keys, defaults and rules.

Read by the CDK app (``infra``) and by ``ckpt-pipeline preflight``; plain Python, no aws_cdk
import, so the operator tools need no CDK and the rules are tested without synthesizing.
"""
