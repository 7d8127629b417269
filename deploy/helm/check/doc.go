// Package check renders the slowrank Helm chart with Helm's own engine and
// validates what it renders against the Kubernetes API types (strictly:
// an unknown or misspelt field fails), for the chart's default values and
// the variants an operator may pick. It is a module of its own so that
// Helm and the Kubernetes API stay out of slowrank's dependencies:
//
//	cd deploy/helm/check && go test ./...
package check
