//! The control plane as each daemon decodes it: tarpc messages through Flyt's postcard codec
//! (`flyt_daemon_kit::codec::decode`: one whole message, no trailing bytes, a panicking decoder
//! an error), requests on the serving side and responses on the calling side, for every service.
#![no_main]

use flyt_protocol::control::cluster::{
    ClusterAdminRequest, ClusterAdminResponse, ClusterClientRequest, ClusterClientResponse, ClusterNodeRequest, ClusterNodeResponse,
};
use flyt_protocol::control::node::{NodeManagerControlRequest, NodeManagerControlResponse};
use flyt_protocol::control::rpc_server::{RpcServerControlRequest, RpcServerControlResponse};
use serde::de::DeserializeOwned;

fn decode<T: DeserializeOwned>(bytes: &[u8]) {
    drop(flyt_daemon_kit::codec::decode::<T>(bytes));
}

libfuzzer_sys::fuzz_target!(
    // The codec catches a decoder's panic on purpose; libFuzzer's hook would abort on it first
    // (and the default one would print every caught panic). A panic that escapes the target
    // still aborts the run: the harness checks for one.
    init: std::panic::set_hook(Box::new(|_| {})),
    |data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    match selector % 10 {
        0 => decode::<tarpc::ClientMessage<ClusterNodeRequest>>(rest),
        1 => decode::<tarpc::Response<ClusterNodeResponse>>(rest),
        2 => decode::<tarpc::ClientMessage<ClusterClientRequest>>(rest),
        3 => decode::<tarpc::Response<ClusterClientResponse>>(rest),
        4 => decode::<tarpc::ClientMessage<ClusterAdminRequest>>(rest),
        5 => decode::<tarpc::Response<ClusterAdminResponse>>(rest),
        6 => decode::<tarpc::ClientMessage<NodeManagerControlRequest>>(rest),
        7 => decode::<tarpc::Response<NodeManagerControlResponse>>(rest),
        8 => decode::<tarpc::ClientMessage<RpcServerControlRequest>>(rest),
        _ => decode::<tarpc::Response<RpcServerControlResponse>>(rest),
    }
    }
);
