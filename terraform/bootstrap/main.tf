# Created once, before terraform/ is initialised: the versioned bucket of its remote state.
# It holds no secret (terraform/ puts none in state). It survives `terraform destroy` of the
# environment on purpose; remove it last: docs/deploy-gcp.md, "Teardown".
terraform {
  required_version = ">= 1.6"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.10"
    }
  }
}

variable "project_id" {
  type = string
}

resource "google_storage_bucket" "tfstate" {
  # checkov:skip=CKV_GCP_62: Access logs of a state bucket would need a second bucket that outlives teardown; Cloud Audit Logs record access.
  name                        = "${var.project_id}-payouts-tfstate"
  project                     = var.project_id
  location                    = "EUROPE-CENTRAL2"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false
  versioning {
    enabled = true
  }
  lifecycle_rule {
    condition {
      num_newer_versions = 20
    }
    action {
      type = "Delete"
    }
  }
}

output "bucket" {
  value = google_storage_bucket.tfstate.name
}
