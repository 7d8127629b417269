// Package admission is slowrank's mutating admission webhook for Pods: it
// answers the API server's admission.k8s.io/v1 AdmissionReview with a JSON
// patch that gives an opted-in pod what docs/deploy.md section 2.2 asks of a
// training pod — the node's library directory as a read-only hostPath volume,
// a read-only mount of it in every container, and CUDA_INJECTION64_PATH (and,
// when configured, NCCL_PROFILER_PLUGIN) naming the injection library.
//
// # What is patched
//
// Only pods labelled InjectLabel="true" (the chart's objectSelector sends
// only those; the handler checks again). Every regular container is patched;
// init containers are not: they run before training, and a CUDA init step
// that loaded the library would only be a process the agent ignores.
// Nothing a pod already has is changed: a volume named VolumeName is reused,
// a container that mounts something at the library directory keeps it, and
// a container that sets one of the variables keeps its value (the response
// warns that it was kept). A variable that a container may get from envFrom
// cannot be seen here; the explicit one added takes precedence, and the
// response says so. A pod patched once yields an empty patch: the handler is
// idempotent, as reinvocationPolicy: IfNeeded requires.
//
// # Failing open
//
// The webhook never refuses a pod. Bad input (a body too large, not JSON,
// not a v1 AdmissionReview of a Pod) is answered allowed, without a patch,
// with a warning; the chart's failurePolicy: Ignore admits the pod when the
// webhook is down or slow. Every answer is counted (Stats).
//
// # Concurrency
//
// Handler is safe for concurrent use; Stats may be read at any time.
//
// admission imports no other slowrank package and no Kubernetes module: it
// decodes the few fields it needs from the review, with exact keys as the
// API server does, and ignores the rest; its certificate comes from the
// caller (internal/certfile's reloader, which its tests use too). Its tests
// apply the patches with the JSON patch library the API server uses.
package admission
