package admission

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The AdmissionReview version this webhook speaks (the chart's
// admissionReviewVersions lists only it).
const (
	reviewAPIVersion = "admission.k8s.io/v1"
	reviewKind       = "AdmissionReview"
)

// review is the part of an admission.k8s.io/v1 AdmissionReview that the
// webhook reads, and the whole of what it answers.
type review struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Request    *request  `json:"request,omitempty"`
	Response   *response `json:"response,omitempty"`
}

type request struct {
	UID       string           `json:"uid"`
	Kind      groupVersionKind `json:"kind"`
	Namespace string           `json:"namespace"`
	Operation string           `json:"operation"`
	Object    json.RawMessage  `json:"object"`
}

type groupVersionKind struct {
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

type response struct {
	UID       string   `json:"uid"`
	Allowed   bool     `json:"allowed"`
	PatchType string   `json:"patchType,omitempty"`
	Patch     []byte   `json:"patch,omitempty"` // JSON, base64 on the wire
	Warnings  []string `json:"warnings,omitempty"`
}

// errNotPodCreate marks a well-formed review that is not the creation of a
// Pod: answered allowed, unpatched, and counted as skipped, not as an error.
var errNotPodCreate = errors.New("not a pod creation")

// decodeReview parses an AdmissionReview and the Pod it carries. The uid is
// returned whenever it could be read, so that even a refused review gets an
// answer the API server can match to its request.
func decodeReview(body []byte) (uid string, p *pod, err error) {
	var rv review
	if err := json.Unmarshal(body, &rv); err != nil {
		return "", nil, fmt.Errorf("decoding the AdmissionReview: %w", err)
	}
	if rv.Request != nil {
		uid = rv.Request.UID
	}
	if rv.APIVersion != reviewAPIVersion || rv.Kind != reviewKind {
		return uid, nil, fmt.Errorf("want a %s %s, got %q %q", reviewAPIVersion, reviewKind, rv.APIVersion, rv.Kind)
	}
	req := rv.Request
	if req == nil || req.UID == "" {
		return uid, nil, errors.New("the AdmissionReview has no request uid")
	}
	if req.Kind != (groupVersionKind{Version: "v1", Kind: "Pod"}) || req.Operation != "CREATE" {
		return uid, nil, fmt.Errorf("%w: %s %s/%s/%s", errNotPodCreate, req.Operation, req.Kind.Group, req.Kind.Version, req.Kind.Kind)
	}
	if p, err = decodePod(req.Object); err != nil {
		return uid, nil, err
	}
	return uid, p, nil
}

// encodeReview is the answer to the review uid: always allowed (the webhook
// fails open), with the patch when there is one.
func encodeReview(uid string, ops []Op, warnings []string) ([]byte, error) {
	resp := &response{UID: uid, Allowed: true, Warnings: warnings}
	if len(ops) > 0 {
		patch, err := json.Marshal(ops)
		if err != nil {
			return nil, fmt.Errorf("encoding the patch: %w", err)
		}
		resp.PatchType, resp.Patch = "JSONPatch", patch
	}
	out, err := json.Marshal(review{APIVersion: reviewAPIVersion, Kind: reviewKind, Response: resp})
	if err != nil {
		return nil, fmt.Errorf("encoding the AdmissionReview: %w", err)
	}
	return out, nil
}
