"""The VPC the proxy, the database and the Lambda functions live in: imported or created."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from aws_cdk import Annotations, Names, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.settings import PipelineSettings

# The tag the stack puts on its in-VPC functions' roles; the endpoint policies admit only them.
PRINCIPAL_TAG = "ckpt-pipeline-stack"


class PipelineNetwork(Construct):
    """``vpc`` + ``private_subnets``; a new VPC has isolated subnets and interface endpoints."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: PipelineSettings) -> None:
        super().__init__(scope, construct_id)
        self.endpoints: list[ec2.InterfaceVpcEndpoint] = []
        # Every interface endpoint by the service prefix its policy names (sqs, secretsmanager,
        # xray, lambda), for :meth:`restrict_endpoints`.
        self.endpoints_by_service: dict[str, ec2.InterfaceVpcEndpoint] = {}
        if settings.network is None:
            self.vpc: ec2.IVpc = self._new_vpc()
            self.private_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
        else:
            existing = settings.network
            self.vpc = ec2.Vpc.from_vpc_attributes(
                self,
                "Vpc",
                vpc_id=existing.vpc_id,
                availability_zones=list(existing.availability_zones),
                private_subnet_ids=list(existing.private_subnet_ids),
            )
            self.private_subnets = ec2.SubnetSelection(subnets=self.vpc.private_subnets)
            # Only security groups and subnets are placed in the VPC; no route is read or added.
            Annotations.of(self).acknowledge_warning(
                "@aws-cdk/aws-ec2:noSubnetRouteTableId", "the stack never touches route tables"
            )
        if settings.create_vpc_endpoints:
            # The writer sends poison records to the DLQ, the migration reads the master and
            # writer secrets, the writer's X-Ray daemon ships its traces: without NAT those calls
            # need interface endpoints (https://docs.aws.amazon.com/vpc/latest/privatelink/aws-services-privatelink-support.html,
            # https://docs.aws.amazon.com/xray/latest/devguide/xray-security-vpc-endpoint.html).
            for name, prefix, service in (
                ("Sqs", "sqs", ec2.InterfaceVpcEndpointAwsService.SQS),
                (
                    "SecretsManager",
                    "secretsmanager",
                    ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER,
                ),
                ("XRay", "xray", ec2.InterfaceVpcEndpointAwsService.XRAY),
            ):
                endpoint = self._interface_endpoint(self, name, service)
                self.endpoints.append(endpoint)
                self.endpoints_by_service[prefix] = endpoint

    def _new_vpc(self) -> ec2.Vpc:
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr("10.42.0.0/16"),
            # RDS needs subnets in two AZs for its subnet group, the proxy for its endpoints.
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="private", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=24
                )
            ],
        )
        vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(
                logs.LogGroup(
                    self,
                    "FlowLogs",
                    retention=logs.RetentionDays.ONE_MONTH,
                )
            ),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )
        return vpc

    def allow_aws_api_access(self, client: ec2.IConnectable) -> None:
        """Let ``client`` reach SQS / Secrets Manager: the endpoints, or HTTPS via the VPC's NAT."""
        if self.endpoints:
            for endpoint in self.endpoints:
                allow_client_to(client, endpoint, 443, "AWS API calls over the VPC endpoint")
        else:
            for group in client.connections.security_groups:
                group.add_egress_rule(
                    ec2.Peer.any_ipv4(),
                    ec2.Port.tcp(443),
                    "AWS API calls (SQS, Secrets Manager) over HTTPS",
                )

    def add_lambda_api_endpoint(self, scope: Construct, client: ec2.IConnectable) -> None:
        """A Lambda API interface endpoint in ``scope``, reachable by ``client`` only; none when
        the VPC has no endpoints (its NAT reaches the API). Without a NAT a function that calls the
        Lambda API (the breaker) needs it
        (https://docs.aws.amazon.com/lambda/latest/dg/configuration-vpc-endpoints.html). Made in
        the caller's scope: it exists for that one client."""
        if not self.endpoints:
            return
        endpoint = self._interface_endpoint(
            scope, "Lambda", ec2.InterfaceVpcEndpointAwsService.LAMBDA_
        )
        self.endpoints_by_service["lambda"] = endpoint
        allow_client_to(client, endpoint, 443, "Lambda API over the VPC endpoint")

    def _interface_endpoint(
        self, scope: Construct, name: str, service: ec2.InterfaceVpcEndpointAwsService
    ) -> ec2.InterfaceVpcEndpoint:
        # An endpoint's network interfaces only answer; they open no connection, so its group
        # allows no egress (CDK's default group would allow all).
        group = ec2.SecurityGroup(
            scope,
            f"{name}EndpointSecurityGroup",
            vpc=self.vpc,
            description=f"{name} interface endpoint: in from the pipeline functions only",
            allow_all_outbound=False,
        )
        return ec2.InterfaceVpcEndpoint(
            scope,
            f"{name}Endpoint",
            vpc=self.vpc,
            service=service,
            subnets=self.private_subnets,
            private_dns_enabled=True,
            open=False,  # only the functions granted below may connect
            security_groups=[group],
        )

    def restrict_endpoints(
        self, roles: Sequence[iam.IRole], resources: Mapping[str, Sequence[str]]
    ) -> None:
        """Endpoint policies: only the stack's own functions (``roles``, tagged here) may call
        through an endpoint, and for ``resources``' services only on those resources (the
        stack's queues, its secrets). Without a policy an endpoint passes any principal's call to
        any resource (https://docs.aws.amazon.com/vpc/latest/privatelink/vpc-endpoints-access.html);
        X-Ray and the Lambda API calls the functions make take no resource ARNs: ``*`` there.

        The roles are matched by a tag (``aws:PrincipalTag``: a role session carries its role's
        tags), not by their ARNs: an ARN would make each endpoint depend on the roles, and the
        writer's role is created after the migration, which waits for the endpoints (a cycle)."""
        stack = Stack.of(self)
        for role in roles:
            Tags.of(role).add(PRINCIPAL_TAG, stack.stack_name)
        for prefix, endpoint in self.endpoints_by_service.items():
            endpoint.add_to_policy(
                iam.PolicyStatement(
                    sid="OnlyThisStacksFunctions",
                    principals=[iam.AnyPrincipal()],
                    actions=[f"{prefix}:*"],
                    resources=list(resources.get(prefix, ["*"])),
                    conditions={
                        "StringEquals": {
                            f"aws:PrincipalTag/{PRINCIPAL_TAG}": stack.stack_name,
                            "aws:PrincipalAccount": stack.account,
                        }
                    },
                )
            )


def allow_client_to(
    client: ec2.IConnectable, target: ec2.IConnectable, port: int, description: str
) -> None:
    """Egress from ``client`` and ingress into ``target`` on ``port``, both owned by the client.

    ``Connections.allow_from``/``allow_to`` put the ingress rule under the target's security group;
    then anything that depends on the target (the migration trigger depends on the endpoints, and
    on the database's group through the instance) also depends on every client's security group,
    and the writer, which runs after the trigger, closes a dependency cycle. Owning both rules on
    the client side keeps the graph one-way.
    """
    for client_group in client.connections.security_groups:
        for target_group in target.connections.security_groups:
            client_group.add_egress_rule(target_group, ec2.Port.tcp(port), description)
            ec2.CfnSecurityGroupIngress(
                cast(Construct, client_group),  # an L2 SecurityGroup, imported or new
                f"To{Names.unique_id(target_group)}:{port}",
                group_id=target_group.security_group_id,
                source_security_group_id=client_group.security_group_id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                description=description,
            )
