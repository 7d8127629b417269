// Command release builds and checks slowrank's release artefacts that a
// Docker daemon or the helm binary would otherwise make:
//
//   - image: an OCI image layout of the agent (the slowrank binary, the
//     CUPTI injection library at /opt/slowrank/lib, and a minimal Debian 12
//     root filesystem from pinned .deb files: glibc for the cgo binary and
//     NVML, busybox for the init container's sh, cp, chmod and mv), with
//     fixed file times and owners, so that the same inputs give the same
//     digest;
//   - chart: helm lint (strict) and helm package of deploy/helm/slowrank,
//     with fixed file times;
//   - verify: the image's config, the files at their paths, and
//     `slowrank --version` and the init container's copy run in a chroot of
//     the image's extracted file system (root);
//   - pin: writes, or checks, the image digest in the chart's values and the
//     manifests.
//
// It is a module of its own so that go-containerregistry and Helm stay out of
// slowrank's dependencies. The Makefile's release targets drive it; see
// deploy/release/README.md.
package main
