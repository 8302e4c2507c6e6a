# GCP dev environment of the payout executor (docs/deploy-gcp.md): europe-central2 only (A-11).
# State lives in a versioned GCS bucket created once by terraform/bootstrap. No secret value is
# ever a Terraform input or output: Secret Manager holds containers only (values are added with
# gcloud), and the databases use IAM authentication, so no password exists (NFR-12).
terraform {
  required_version = ">= 1.6"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.10"
    }
  }
  backend "gcs" {
    # bucket is given at init: terraform init -backend-config="bucket=<project>-payouts-tfstate"
    prefix = "payouts/dev"
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}
