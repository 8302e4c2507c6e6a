# GKE Autopilot (A-12): workers, lock servers, rail proxy, rail stub and the etcd StatefulSet.
resource "google_container_cluster" "dev" {
  # checkov:skip=CKV_GCP_13: Autopilot manages client certificate auth (disabled by default).
  # checkov:skip=CKV_GCP_19: Autopilot disables basic auth; the field is not settable.
  # checkov:skip=CKV_GCP_24: PodSecurityPolicy no longer exists; the namespace enforces the restricted Pod Security Standard (deploy/k8s/00-namespace.yaml).
  # checkov:skip=CKV_GCP_65: Google Groups for RBAC needs a Workspace domain the dev project does not have.
  # checkov:skip=CKV_GCP_66: Binary Authorization needs an attestor pipeline that is out of scope for dev; images are pulled by digest.
  # checkov:skip=CKV_GCP_69: Autopilot always runs the GKE metadata server (Workload Identity is on).
  # checkov:skip=CKV_GCP_68: Autopilot always uses Shielded GKE nodes with secure boot.
  # checkov:skip=CKV_GCP_61: VPC flow logs are on the subnetwork; intranode visibility adds cost without a use in dev.
  # checkov:skip=CKV_GCP_12: Autopilot enforces network policy (Dataplane V2); deploy/k8s/05-network.yaml has the policies.
  # checkov:skip=CKV_GCP_21: Labels are applied through resource_labels below; the check does not see Autopilot's.
  # checkov:skip=CKV_GCP_67: Autopilot does not expose legacy metadata endpoints.
  # checkov:skip=CKV_GCP_23: Alias IP ranges are used (ip_allocation_policy); the check misreads Autopilot.
  # checkov:skip=CKV_GCP_25: The cluster is private (private_cluster_config); the check misreads Autopilot.
  # checkov:skip=CKV_GCP_18: The control plane is reachable only from master_authorized_networks_config below.
  # checkov:skip=CKV_GCP_20: master_authorized_networks_config is set below.
  # checkov:skip=CKV_GCP_64: Nodes are private (enable_private_nodes); the check misreads Autopilot.
  # checkov:skip=CKV_GCP_70: The release channel is REGULAR (set below).
  # checkov:skip=CKV_GCP_71: Autopilot always enables Shielded GKE nodes.
  # checkov:skip=CKV_GCP_72: Autopilot always enables integrity monitoring.
  # checkov:skip=CKV_GCP_1: Autopilot always enables Stackdriver logging.
  # checkov:skip=CKV_GCP_8: Autopilot always enables Stackdriver monitoring.
  # checkov:skip=CKV_GCP_7: Autopilot has no legacy ABAC.
  name                = "payouts-dev"
  location            = var.region
  enable_autopilot    = true
  network             = google_compute_network.vpc.id
  subnetwork          = google_compute_subnetwork.gke.id
  deletion_protection = false # NFR-14: `terraform destroy` must leave no billable resource
  resource_labels     = { env = "dev", app = "payouts" }

  release_channel {
    channel = "REGULAR"
  }
  ip_allocation_policy {
    cluster_secondary_range_name  = "pods"
    services_secondary_range_name = "services"
  }
  private_cluster_config {
    enable_private_nodes    = true
    enable_private_endpoint = false
    master_ipv4_cidr_block  = "172.16.0.0/28"
  }
  master_authorized_networks_config {
    cidr_blocks {
      cidr_block   = "10.10.0.0/20"
      display_name = "vpc"
    }
  }
  secret_manager_config {
    enabled = true
  }
  cluster_autoscaling {
    auto_provisioning_defaults {
      service_account = google_service_account.nodes.email
      oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    }
  }
  depends_on = [google_billing_budget.dev, google_project_service.apis]
}
