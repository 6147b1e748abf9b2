"""The VPC the proxy, the database and the Lambda functions live in: imported or created."""

from __future__ import annotations

from typing import cast

from aws_cdk import Annotations, Names
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.settings import PipelineSettings


class PipelineNetwork(Construct):
    """``vpc`` + ``private_subnets``; a new VPC has isolated subnets and interface endpoints."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: PipelineSettings) -> None:
        super().__init__(scope, construct_id)
        self.endpoints: list[ec2.InterfaceVpcEndpoint] = []
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
            for name, service in (
                ("Sqs", ec2.InterfaceVpcEndpointAwsService.SQS),
                ("SecretsManager", ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER),
                ("XRay", ec2.InterfaceVpcEndpointAwsService.XRAY),
            ):
                self.endpoints.append(
                    ec2.InterfaceVpcEndpoint(
                        self,
                        f"{name}Endpoint",
                        vpc=self.vpc,
                        service=service,
                        subnets=self.private_subnets,
                        private_dns_enabled=True,
                        open=False,  # only the functions granted below may connect
                    )
                )

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
        endpoint = ec2.InterfaceVpcEndpoint(
            scope,
            "LambdaEndpoint",
            vpc=self.vpc,
            service=ec2.InterfaceVpcEndpointAwsService.LAMBDA_,
            subnets=self.private_subnets,
            private_dns_enabled=True,
            open=False,
        )
        allow_client_to(client, endpoint, 443, "Lambda API over the VPC endpoint")


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
