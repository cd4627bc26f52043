//! Flyt's Kubernetes device plugin (`flyt-device-plugin`, `docs/kubernetes.md`): on every node
//! it advertises `flyt.dev/gpu` to the kubelet (the `v1beta1` device plugin gRPC API) with as
//! many devices as the node's jobs could get from the Flyt cluster, and gives each container
//! that asks for them its own Flyt allocation through the node's client manager (its job
//! socket): the environment, the library mount and annotations a pod needs to run CUDA
//! programs through Flyt with no change but a resource request.

pub mod api;
pub mod devices;
pub mod plugin;
