//! Moving an allocation, its running apps included, to another node (`flytctl migrate`), and
//! checkpointing its sessions where they are (`flytctl checkpoint`).
//!
//! The cluster manager orchestrates a move; each node manager does the steps on its own node
//! (through its rpc-servers' control sockets and its snapshot folder). Under the VM's lock:
//!
//! 1. The target is checked (known, up, undrained, room on the GPU as placement counts it; an
//!    allocation of several GPUs needs as many on another node, the best-joined set; or, moving
//!    one of its GPUs, another GPU of its node, each GPU that stays with room for a second slice)
//!    and `pending_move` is stored, `Copying`: both ends' GPUs hold the slice from then on (a GPU
//!    both ends serve holds two). Each end's server is named by its whole GPU set: a move of one
//!    GPU may keep the first GPU, and then both servers have it.
//! 2. The target's node manager starts a server for the same allocation id and size, so the
//!    apps' tokens (signed per allocation id) are valid there too.
//! 3. Every session of the source's server is checkpointed, all at once (each app pauses at its
//!    next CUDA call); each snapshot is copied to the target node when that is another host
//!    (the target's node manager pulls it from the source's in chunks) and restored in the
//!    target's server, where it waits for its app.
//! 4. `Switching` is stored, the record naming the target: new apps are sent there.
//! 5. Each paused app is released to the target's address; it reconnects there with its
//!    snapshot's name and goes on with every pointer as it was. A session the source opened
//!    meanwhile is moved the same way.
//! 6. Once the source's sessions are gone, its server is stopped and the move cleared.
//!
//! A failure in 2 or 3 rolls back: every app is released to go on at the source (a server
//! ignores the release of a session that is not paused, so all may be told), the target's
//! server is stopped, the move is cleared, and the caller is told why. A cluster manager that
//! dies mid-move rolls a `Copying` move back and finishes a `Switching` one when it is back
//! ([`Cluster::settle_move_locked`], run at the node's next report or the VM's next request).
//!
//! A restart of an allocation's rpc-server (`flytctl restart-server`) is one step of its node
//! manager (checkpoint every session, release the apps to the address they used, replace the
//! process, same addresses); the cluster manager holds the VM's lock meanwhile, so node reports
//! leave the allocation alone, and stores the new server's pid afterwards.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use flyt_daemon_kit::{failpoint, rpc};
use flyt_protocol::control::{
    cluster::{
        AfterCheckpoint, AllocationRecord, CheckpointReport, ControlError, MovePhase, MoveReport, MovedSession, NodeHealth, PendingMove,
        RestartReport, ServerReport,
    },
    node::{FetchedSnapshot, NodeManagerControlClient, ServerRef, ServerSpec, SessionSnapshot},
    rpc_server::{SessionStatus, SnapshotInfo, says_session_ended},
};

use super::{Cluster, NODE_CALL_TIMEOUT, WhenUnreachable, settled, store_error};
use crate::{
    model::{Model, data_address},
    store::Store,
};

/// Deadline of a move's long node calls (a checkpoint, a snapshot's copy, a restore): device
/// memory by the tens of GiB.
const MOVE_CALL_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long released apps get to leave the source for the target.
const DEPARTURE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a session the source opened during a move may take to pause.
const STRAGGLER_PAUSE_MS: u64 = 30_000;

/// One end of a move, as the cluster manager knows the node.
struct NodeEnd {
    node_id: String,
    /// The GPUs of the node the allocation's server at this end serves, its first first.
    gpu: u32,
    extra_gpus: Vec<u32>,
    host_ip: String,
    boot_id: String,
    control_address: String,
}

/// A session restored on the target while its app is paused at the source.
struct CopiedSession {
    session: SessionStatus,
    snapshot: SnapshotInfo,
    transfer_us: u64,
    restore_us: u64,
    gpu_to_gpu: bool,
}

impl CopiedSession {
    /// The session once its app was sent to `to`.
    fn sent_to(self, to: String) -> MovedSession {
        MovedSession {
            snapshot: self.snapshot,
            transfer_us: self.transfer_us,
            restore_us: self.restore_us,
            to,
            gpu_to_gpu: self.gpu_to_gpu,
        }
    }
}

/// `0,1`: a server's GPUs, its first first.
fn gpu_list(first: u32, extra: &[u32]) -> String {
    std::iter::once(first).chain(extra.iter().copied()).map(|gpu| gpu.to_string()).collect::<Vec<_>>().join(",")
}

impl NodeEnd {
    /// The allocation's server at this end, named by its whole GPU set: a move of one GPU of
    /// an allocation runs a second server with the same first GPU beside the first.
    fn server(&self, id: &str) -> ServerRef {
        ServerRef::of_set(id, self.gpu, &self.extra_gpus)
    }
}

/// The server a move leaves (`PendingMove::from_*`) and the one it starts (`to_*`).
fn source_server(id: &str, pending: &PendingMove) -> ServerRef {
    ServerRef::of_set(id, pending.from_gpu, &pending.from_extra_gpus)
}

fn target_server(id: &str, pending: &PendingMove) -> ServerRef {
    ServerRef::of_set(id, pending.to_gpu, &pending.to_extra_gpus)
}

fn micros_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

impl<S: Store> Cluster<S> {
    /// Runs one call on node `node_id`'s node manager; a call that does not reach it drops the
    /// connection and says which node did not answer.
    async fn node_call<T, F, Fut>(&self, node_id: &str, call: F) -> Result<T, ControlError>
    where
        F: FnOnce(NodeManagerControlClient) -> Fut,
        Fut: Future<Output = Result<Result<T, ControlError>, tarpc::client::RpcError>>,
    {
        let address = self.node_address(node_id).await?;
        let client = self.node_client(node_id, &address).await?;
        match call(client).await {
            Ok(result) => result,
            Err(error) => Err(self.node_call_failed(node_id, &address, &error).await),
        }
    }

    /// The sessions of an allocation's server `server` on `node_id`.
    async fn sessions_on(&self, node_id: &str, server: ServerRef) -> Result<Vec<SessionStatus>, ControlError> {
        self.node_call(node_id, |node| async move { node.list_sessions(rpc::deadline(NODE_CALL_TIMEOUT), server).await }).await
    }

    /// Checkpoints session `session_id` of `server` on `node_id` (see
    /// `NodeManagerControl::checkpoint_session`).
    async fn checkpoint_on(
        &self,
        node_id: &str,
        server: ServerRef,
        session_id: u64,
        dir: Option<String>,
        timeout_ms: u64,
        on_device: bool,
    ) -> Result<SessionSnapshot, ControlError> {
        let deadline = rpc::deadline(MOVE_CALL_TIMEOUT + Duration::from_millis(timeout_ms));
        self.node_call(
            node_id,
            |node| async move { node.checkpoint_session(deadline, server, session_id, dir, timeout_ms, on_device).await },
        )
        .await
    }

    async fn fetch_on(&self, node_id: &str, id: &str, from: &str, name: &str) -> Result<FetchedSnapshot, ControlError> {
        let (id, from, name) = (id.to_string(), from.to_string(), name.to_string());
        self.node_call(node_id, |node| async move { node.fetch_snapshot(rpc::deadline(MOVE_CALL_TIMEOUT), id, from, name).await }).await
    }

    async fn restore_on(&self, node_id: &str, server: ServerRef, dir: &str, name: &str) -> Result<(), ControlError> {
        let (dir, name) = (dir.to_string(), name.to_string());
        self.node_call(node_id, |node| async move { node.restore_snapshot(rpc::deadline(MOVE_CALL_TIMEOUT), server, dir, name).await })
            .await
    }

    async fn release_on(&self, node_id: &str, server: ServerRef, session_id: u64, to: Option<String>) -> Result<(), ControlError> {
        self.node_call(node_id, |node| async move { node.release_session(rpc::deadline(NODE_CALL_TIMEOUT), server, session_id, to).await })
            .await
    }

    async fn discard_on(&self, node_id: &str, id: &str) -> Result<(), ControlError> {
        let id = id.to_string();
        self.node_call(node_id, |node| async move { node.discard_snapshots(rpc::deadline(NODE_CALL_TIMEOUT), id).await }).await
    }

    async fn node_end(&self, node_id: &str, gpu: u32, extra_gpus: &[u32]) -> Result<NodeEnd, ControlError> {
        let model = self.model.lock().await;
        let node = model.nodes.get(node_id).ok_or_else(|| ControlError::UnknownNode(node_id.to_string()))?;
        Ok(NodeEnd {
            node_id: node_id.to_string(),
            gpu,
            extra_gpus: extra_gpus.to_vec(),
            host_ip: node.record.host_ip.clone(),
            boot_id: node.record.boot_id.clone(),
            control_address: node.record.control_address.clone(),
        })
    }

    /// The allocation `target` names (id or VM ip): its id and VM.
    async fn find_target(&self, target: &str) -> Result<(String, String), ControlError> {
        let model = self.model.lock().await;
        let allocation = model.find_allocation(target).ok_or_else(|| ControlError::UnknownAllocation(target.to_string()))?;
        Ok((allocation.id.clone(), allocation.vm_ip.clone()))
    }

    /// Finishes a step left under way before an admin step; the caller holds the VM's lock.
    async fn settle_before_admin_step(self: &Arc<Self>, id: &str) -> Result<(), ControlError> {
        let unsettled = self.model.lock().await.allocations.get(id).is_some_and(|allocation| !settled(allocation));
        if unsettled {
            self.settle_locked(id, WhenUnreachable::Retry).await?;
        }
        Ok(())
    }

    /// Moves allocation `target` (id or VM ip) with its apps to node `to_node`; with
    /// `one_gpu`, only its GPU at that index, to GPU `to_gpu` of its own node (see
    /// [`Model::check_move_one_gpu`]): the apps move to a new server of the new set, which runs
    /// beside the old one on the GPUs that stay until the move is over.
    ///
    /// [`Model::check_move_one_gpu`]: crate::model::Model::check_move_one_gpu
    pub(super) async fn migrate(
        self: Arc<Self>,
        target: String,
        to_node: String,
        to_gpu: Option<u32>,
        one_gpu: Option<u32>,
        timeout_ms: u64,
    ) -> Result<MoveReport, ControlError> {
        let started = Instant::now();
        let (id, vm_ip) = self.find_target(&target).await?;
        let vm_lock = self.vm_lock(&vm_ip);
        let _one_at_a_time = vm_lock.lock().await;
        self.settle_before_admin_step(&id).await?;
        let (memory, pending) = {
            let mut model = self.model.lock().await;
            let mut allocation = model.running(&id, &target)?.clone();
            if allocation.is_spread() {
                return Err(ControlError::Invalid(format!(
                    "allocation {id} is spread over nodes {} (--spread): moving it is not supported yet: its apps hold one session on each node's server, and a session spread over several servers cannot be paused and continued elsewhere (the client refuses it)",
                    super::node_list(&allocation)
                )));
            }
            // An allocation of several GPUs moves whole, to as many GPUs of another node, or one
            // of its GPUs to another GPU of its node.
            let (to_gpu, to_extra_gpus, to_sm_percentage) = if let Some(index) = one_gpu {
                let (gpus, percentage) = model.check_move_one_gpu(&allocation, index, &to_node, to_gpu)?;
                (gpus[0], gpus[1..].to_vec(), percentage)
            } else if allocation.extra_gpus.is_empty() {
                let (to_gpu, percentage) = model.check_move(&allocation, &to_node, to_gpu)?;
                (to_gpu, Vec::new(), percentage)
            } else {
                let (gpus, percentage) = model.check_move_set(&allocation, &to_node, to_gpu)?;
                (gpus[0], gpus[1..].to_vec(), percentage)
            };
            let pending = PendingMove {
                from_node: allocation.node_id.clone(),
                from_gpu: allocation.gpu,
                to_node: to_node.clone(),
                to_gpu,
                to_sm_percentage,
                phase: MovePhase::Copying,
                from_extra_gpus: allocation.extra_gpus.clone(),
                to_extra_gpus,
            };
            // Stored before either node hears of it: a restart rolls it back.
            allocation.pending_move = Some(pending.clone());
            self.store.put_allocation(&allocation).await.map_err(store_error)?;
            model.allocations.insert(id.clone(), allocation.clone());
            (allocation.memory, pending)
        };
        tracing::info!(
            allocation = %id,
            vm = %vm_ip,
            from = %format!("{}/{}", pending.from_node, gpu_list(pending.from_gpu, &pending.from_extra_gpus)),
            to = %format!("{}/{}", pending.to_node, gpu_list(pending.to_gpu, &pending.to_extra_gpus)),
            "moving the allocation with its apps"
        );
        failpoint::hit("move.stored_copying");
        let (server, copied) = match self.copy_to_target(&id, memory, &pending, timeout_ms).await {
            Ok(copied) => copied,
            Err(reason) => {
                tracing::warn!(allocation = %id, %reason, "the move failed; the apps go on at the source");
                self.roll_back_move(&id, &pending).await;
                return Err(ControlError::MoveFailed(reason));
            }
        };
        failpoint::hit("move.copied");
        if let Err(error) = self.switch_to_target(&id, &pending, &server).await {
            tracing::warn!(allocation = %id, %error, "the move could not be recorded; the apps go on at the source");
            self.roll_back_move(&id, &pending).await;
            return Err(error);
        }
        failpoint::hit("move.switched");
        let switched = PendingMove { phase: MovePhase::Switching, ..pending.clone() };
        let (sessions, left_behind) = self.finish_move(&id, &switched, Some(copied)).await?;
        let allocation = self
            .model
            .lock()
            .await
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| ControlError::MoveFailed(format!("allocation {id} was released during the move")))?;
        tracing::info!(allocation = %id, node = %allocation.node_id, gpu = allocation.gpu, sessions = sessions.len(), took_ms = micros_since(started) / 1000, "allocation moved");
        Ok(MoveReport {
            allocation,
            from_node: pending.from_node,
            from_gpu: pending.from_gpu,
            from_extra_gpus: pending.from_extra_gpus,
            sessions,
            left_behind,
            total_us: micros_since(started),
        })
    }

    /// Steps 2 and 3: the target's server, and every session restored in it. `Err` says why
    /// not; the caller rolls back.
    async fn copy_to_target(
        &self,
        id: &str,
        memory: u64,
        pending: &PendingMove,
        timeout_ms: u64,
    ) -> Result<(ServerReport, Vec<CopiedSession>), String> {
        let spec = ServerSpec {
            allocation_id: id.to_string(),
            gpu: pending.to_gpu,
            extra_gpus: pending.to_extra_gpus.clone(),
            memory,
            sm_percentage: pending.to_sm_percentage,
            address_window: 0,
        };
        let server = self
            .start_on_node(&pending.to_node, spec)
            .await
            .map_err(|error| format!("{} could not start a server for it: {error}", pending.to_node))?;
        failpoint::hit("move.target_started");
        let ends = (
            self.node_end(&pending.from_node, pending.from_gpu, &pending.from_extra_gpus).await,
            self.node_end(&pending.to_node, pending.to_gpu, &pending.to_extra_gpus).await,
        );
        let (source, target) = match ends {
            (Ok(source), Ok(target)) => (source, target),
            (Err(error), _) | (_, Err(error)) => return Err(error.to_string()),
        };
        let sessions = self
            .sessions_on(&source.node_id, source.server(id))
            .await
            .map_err(|error| format!("its sessions on {} could not be listed: {error}", source.node_id))?;
        let outcomes =
            futures::future::join_all(sessions.into_iter().map(|session| self.copy_session(id, session, &source, &target, timeout_ms)))
                .await;
        let (copied, failures): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(Result::is_ok);
        if let Some(Err(first)) = failures.first() {
            let more =
                if failures.len() > 1 { format!(" (and {} more session(s) could not move)", failures.len() - 1) } else { String::new() };
            return Err(format!("{first}{more}"));
        }
        Ok((server, copied.into_iter().filter_map(Result::ok).flatten().collect()))
    }

    /// Checkpoints one session at the source (its app pauses) and restores it on the target:
    /// GPU to GPU when both ends share a host, else (or when that fails, the app going on
    /// meanwhile) through the snapshot file. `None`: the session ended since it was listed (its
    /// app exited, or its client's reconnect grace ran out): nothing of it to move.
    async fn copy_session(
        &self,
        id: &str,
        session: SessionStatus,
        source: &NodeEnd,
        target: &NodeEnd,
        timeout_ms: u64,
    ) -> Result<Option<CopiedSession>, String> {
        let one_host = source.host_ip == target.host_ip && source.boot_id == target.boot_id;
        // Twice GPU to GPU: a target worker whose driver already holds part of the app's
        // addresses refuses, and the next worker's layout differs (the file costs seconds).
        for attempt in [1, 2].into_iter().filter(|_| one_host) {
            match self.copy_session_on_device(id, &session, source, target, timeout_ms).await {
                Ok(copied) => return Ok(Some(copied)),
                Err(reason) => {
                    tracing::info!(allocation = id, session = session.session_id, attempt, %reason, "not GPU to GPU");
                }
            }
        }
        if one_host {
            tracing::info!(allocation = id, session = session.session_id, "not GPU to GPU; through the snapshot file");
        }
        let session_id = session.session_id;
        let snapshot = match self.checkpoint_on(&source.node_id, source.server(id), session_id, None, timeout_ms, false).await {
            Ok(snapshot) => snapshot,
            Err(error) if says_session_ended(&error.to_string(), session_id) => {
                tracing::info!(allocation = id, session = session_id, "the session ended before its checkpoint: nothing to move");
                return Ok(None);
            }
            Err(error) => {
                return Err(format!(
                    "session {session_id} ({} pid {}) cannot be checkpointed: {error}",
                    session.client.program, session.client.pid
                ));
            }
        };
        let name = snapshot.info.name.clone();
        let copy_started = Instant::now();
        // On one host the target reads the source's folder; between hosts its node manager
        // pulls the file into its own.
        let (dir, transfer_us) = if one_host {
            (snapshot.dir.clone(), 0)
        } else {
            let fetched = self
                .fetch_on(&target.node_id, id, &source.control_address, &name)
                .await
                .map_err(|error| format!("the snapshot of session {session_id} could not be copied to {}: {error}", target.node_id))?;
            (fetched.dir, micros_since(copy_started))
        };
        let restore_started = Instant::now();
        self.restore_on(&target.node_id, target.server(id), &dir, &name)
            .await
            .map_err(|error| format!("{} refused to restore session {session_id}: {error}", target.node_id))?;
        Ok(Some(CopiedSession {
            session,
            snapshot: snapshot.info,
            transfer_us,
            restore_us: micros_since(restore_started),
            gpu_to_gpu: false,
        }))
    }

    /// [`Self::copy_session`] GPU to GPU: the snapshot holds no device memory, which the
    /// target's worker copies from the paused source's. A refusal leaves the app going on at the
    /// source, with why.
    async fn copy_session_on_device(
        &self,
        id: &str,
        session: &SessionStatus,
        source: &NodeEnd,
        target: &NodeEnd,
        timeout_ms: u64,
    ) -> Result<CopiedSession, String> {
        let session_id = session.session_id;
        let snapshot = self
            .checkpoint_on(&source.node_id, source.server(id), session_id, None, timeout_ms, true)
            .await
            .map_err(|error| error.to_string())?;
        let restore_started = Instant::now();
        if let Err(error) = self.restore_on(&target.node_id, target.server(id), &snapshot.dir, &snapshot.info.name).await {
            // The target cannot take it: the app goes on at the source until the file carries it.
            if let Err(release) = self.release_on(&source.node_id, source.server(id), session_id, None).await {
                return Err(format!("{error}; and the paused session could not be released: {release}"));
            }
            return Err(error.to_string());
        }
        Ok(CopiedSession {
            session: session.clone(),
            snapshot: snapshot.info,
            transfer_us: 0,
            restore_us: micros_since(restore_started),
            gpu_to_gpu: true,
        })
    }

    /// Undoes a move that did not get to `Switching`: every app goes on at the source, the
    /// target's server is stopped (its snapshots with it) and the move is cleared. Best effort:
    /// an app nobody could release resumes by itself within ten minutes, and a target server
    /// left running is stopped at its node's next report.
    async fn roll_back_move(&self, id: &str, pending: &PendingMove) {
        match self.sessions_on(&pending.from_node, source_server(id, pending)).await {
            Ok(sessions) => {
                for session in sessions {
                    if let Err(error) = self.release_on(&pending.from_node, source_server(id, pending), session.session_id, None).await {
                        tracing::warn!(allocation = id, session = session.session_id, %error, "a paused app could not be released; it resumes by itself within ten minutes");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(allocation = id, node = %pending.from_node, %error, "the source's sessions could not be listed; paused apps resume by themselves within ten minutes");
            }
        }
        self.stop_server_on_node(&pending.to_node, target_server(id, pending)).await;
        if let Err(error) = self.discard_on(&pending.from_node, id).await {
            tracing::warn!(allocation = id, node = %pending.from_node, %error, "the move's snapshots were not removed");
        }
        let mut model = self.model.lock().await;
        let Some(mut allocation) = model.allocations.get(id).cloned() else { return };
        allocation.pending_move = None;
        if let Err(error) = self.store.put_allocation(&allocation).await {
            tracing::error!(allocation = id, %error, "the rolled-back move could not be cleared in the store; a restart rolls it back again");
        }
        model.allocations.insert(id.to_string(), allocation);
        tracing::info!(allocation = id, node = %pending.from_node, "move rolled back");
    }

    /// Step 4: the record names the target, with its server, and the move is `Switching`.
    async fn switch_to_target(&self, id: &str, pending: &PendingMove, server: &ServerReport) -> Result<(), ControlError> {
        let mut model = self.model.lock().await;
        let mut allocation = model
            .allocations
            .get(id)
            .cloned()
            .ok_or_else(|| ControlError::MoveFailed(format!("allocation {id} was released during the move")))?;
        allocation.node_id.clone_from(&pending.to_node);
        allocation.gpu = pending.to_gpu;
        allocation.extra_gpus.clone_from(&pending.to_extra_gpus);
        allocation.sm_percentage = pending.to_sm_percentage;
        allocation.addresses.clone_from(&server.addresses);
        allocation.pid = server.pid;
        // The target's own endpoint comes with its node's next report.
        allocation.metrics = None;
        allocation.pending_move = Some(PendingMove { phase: MovePhase::Switching, ..pending.clone() });
        self.store.put_allocation(&allocation).await.map_err(store_error)?;
        tracing::info!(allocation = id, node = %pending.to_node, addresses = ?server.addresses, "the allocation now names its new server; its apps are sent there");
        model.allocations.insert(id.to_string(), allocation);
        Ok(())
    }

    /// Steps 5 and 6: the paused apps are sent to the target, sessions the source opened
    /// meanwhile follow, the source's server is stopped and the move cleared. `copied`: the
    /// sessions this move restored on the target; `None` after a restart, when every session
    /// of the source is told (one that is not paused ignores it). Returns the sessions that
    /// moved and those left behind (with why). A source that cannot be reached keeps the move
    /// `Switching` for the next try.
    async fn finish_move(
        &self,
        id: &str,
        pending: &PendingMove,
        copied: Option<Vec<CopiedSession>>,
    ) -> Result<(Vec<MovedSession>, Vec<String>), ControlError> {
        let source_up = self.model.lock().await.nodes.get(&pending.from_node).is_some_and(|node| node.record.health == NodeHealth::Up);
        let mut moved = Vec::new();
        let mut left_behind = Vec::new();
        if source_up {
            let (source, target) = (
                self.node_end(&pending.from_node, pending.from_gpu, &pending.from_extra_gpus).await?,
                self.node_end(&pending.to_node, pending.to_gpu, &pending.to_extra_gpus).await?,
            );
            let addresses = self.model.lock().await.allocations.get(id).map(|allocation| allocation.addresses.clone()).unwrap_or_default();
            let address_for = |session: &SessionStatus| {
                let same_host = !session.client.boot_id.is_empty() && session.client.boot_id == target.boot_id;
                data_address(&addresses, same_host).unwrap_or_default()
            };
            let (sessions, mut copies): (Vec<SessionStatus>, BTreeMap<u64, CopiedSession>) = match copied {
                Some(copied) => (
                    copied.iter().map(|copy| copy.session.clone()).collect(),
                    copied.into_iter().map(|copy| (copy.session.session_id, copy)).collect(),
                ),
                None => match self.sessions_on(&source.node_id, source.server(id)).await {
                    Ok(sessions) => (sessions, BTreeMap::new()),
                    Err(error @ ControlError::NodeUnreachable { .. }) => return Err(error),
                    // The source's server is gone already (stopped before the crash, or exited):
                    // nobody is left to send.
                    Err(error) => {
                        tracing::info!(allocation = id, node = %source.node_id, %error, "no session left at the source");
                        (Vec::new(), BTreeMap::new())
                    }
                },
            };
            let mut released = BTreeSet::new();
            for session in sessions {
                let to = address_for(&session);
                match self.release_on(&source.node_id, source.server(id), session.session_id, Some(to.clone())).await {
                    Ok(()) => {
                        released.insert(session.session_id);
                        moved.extend(copies.remove(&session.session_id).map(|copy| copy.sent_to(to)));
                    }
                    Err(ControlError::NodeUnreachable { node, reason }) => {
                        return Err(ControlError::NodeUnreachable {
                            node,
                            reason: format!(
                                "{reason}; allocation {id} already runs on {}, and its apps are sent there once this node answers",
                                target.node_id
                            ),
                        });
                    }
                    Err(error) => left_behind.push(format!("session {} could not be released to {to}: {error}", session.session_id)),
                }
            }
            failpoint::hit("move.released");
            // Sessions still at the source once the released apps left were opened meanwhile (or
            // were not paused when a restarted cluster manager told them, and ignored it): they
            // move the same way.
            let stayed = self.wait_for_departures(&source, id, &released).await;
            let mut released_again = BTreeSet::new();
            for session in stayed {
                let session_id = session.session_id;
                let to = address_for(&session);
                match self.copy_session(id, session, &source, &target, STRAGGLER_PAUSE_MS).await {
                    // Gone meanwhile: nothing to release.
                    Ok(None) => {}
                    Ok(Some(copy)) => match self.release_on(&source.node_id, source.server(id), session_id, Some(to.clone())).await {
                        Ok(()) => {
                            released_again.insert(session_id);
                            moved.push(copy.sent_to(to));
                        }
                        Err(error) => left_behind.push(format!("session {session_id} could not be released to {to}: {error}")),
                    },
                    Err(reason) => {
                        let _ = self.release_on(&source.node_id, source.server(id), session_id, None).await;
                        left_behind.push(reason);
                    }
                }
            }
            if !left_behind.is_empty() {
                tracing::warn!(allocation = id, ?left_behind, "sessions that could not follow end with the source's server");
            }
            self.wait_for_departures(&source, id, &released_again).await;
        }
        self.stop_server_on_node(&pending.from_node, source_server(id, pending)).await;
        let mut model = self.model.lock().await;
        if let Some(mut allocation) = model.allocations.get(id).cloned() {
            allocation.pending_move = None;
            self.store.put_allocation(&allocation).await.map_err(store_error)?;
            model.allocations.insert(id.to_string(), allocation);
        }
        tracing::info!(allocation = id, from = %pending.from_node, to = %pending.to_node, moved = moved.len(), left_behind = left_behind.len(), "move finished; the source's server is stopped");
        Ok((moved, left_behind))
    }

    /// Waits (bounded) until the sessions `leaving` are gone from the server of `id` at `end`;
    /// returns the sessions it still has then.
    async fn wait_for_departures(&self, end: &NodeEnd, id: &str, leaving: &BTreeSet<u64>) -> Vec<SessionStatus> {
        let (node_id, deadline) = (end.node_id.as_str(), Instant::now() + DEPARTURE_TIMEOUT);
        loop {
            let sessions = match self.sessions_on(node_id, end.server(id)).await {
                Ok(sessions) => sessions,
                Err(error) => {
                    tracing::warn!(allocation = id, node = node_id, %error, "the source's sessions could not be listed");
                    return Vec::new();
                }
            };
            if !sessions.iter().any(|session| leaving.contains(&session.session_id)) || Instant::now() >= deadline {
                return sessions;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Rolls back a move left `Copying` or finishes one left `Switching` (after a restart, or
    /// when a step's node could not be reached); the caller holds the VM's lock.
    pub(super) async fn settle_move_locked(&self, id: &str) -> Result<(), ControlError> {
        let pending = self.model.lock().await.allocations.get(id).and_then(|allocation| allocation.pending_move.clone());
        let Some(pending) = pending else { return Ok(()) };
        match pending.phase {
            MovePhase::Copying => {
                tracing::info!(allocation = id, to = %pending.to_node, "rolling back a move left under way");
                self.roll_back_move(id, &pending).await;
                Ok(())
            }
            MovePhase::Switching => {
                tracing::info!(allocation = id, to = %pending.to_node, "finishing a move left under way");
                self.finish_move(id, &pending, None).await.map(|_| ())
            }
        }
    }

    /// Checkpoints every session of allocation `target` into `dir` on its node, then lets the
    /// apps go on or stops their sessions.
    pub(super) async fn checkpoint(
        self: Arc<Self>,
        target: String,
        dir: String,
        timeout_ms: u64,
        after: AfterCheckpoint,
    ) -> Result<CheckpointReport, ControlError> {
        if !Path::new(&dir).is_absolute() {
            return Err(ControlError::Invalid(format!("the snapshot folder {dir:?} must be an absolute path (on the allocation's node)")));
        }
        let (id, vm_ip) = self.find_target(&target).await?;
        let vm_lock = self.vm_lock(&vm_ip);
        let _one_at_a_time = vm_lock.lock().await;
        self.settle_before_admin_step(&id).await?;
        let (node_id, gpu) = {
            let model = self.model.lock().await;
            let allocation = running_on_one_node(&model, &id, &target, "checkpointing it")?;
            (allocation.node_id.clone(), allocation.gpu)
        };
        let sessions = self.sessions_on(&node_id, ServerRef::new(&id, Some(gpu))).await?;
        let decision = match after {
            AfterCheckpoint::Resume => None,
            // Empty: the app reconnects to its server's address and waits for its snapshot there.
            AfterCheckpoint::Stop => Some(String::new()),
        };
        let cluster = &*self;
        let outcomes = futures::future::join_all(sessions.iter().map(|session| {
            let (node_id, id, dir, decision) = (&node_id, &id, dir.clone(), decision.clone());
            async move {
                let snapshot = cluster
                    .checkpoint_on(node_id, ServerRef::new(id, Some(gpu)), session.session_id, Some(dir), timeout_ms, false)
                    .await
                    .map_err(|error| error.to_string())?;
                cluster
                    .release_on(node_id, ServerRef::new(id, Some(gpu)), session.session_id, decision)
                    .await
                    .map_err(|error| format!("checkpointed as {} but still paused: {error}", snapshot.info.name))?;
                Ok::<_, String>(snapshot.info)
            }
        }))
        .await;
        let mut report = CheckpointReport { allocation_id: id.clone(), node_id, dir, snapshots: Vec::new(), failed: Vec::new() };
        for (session, outcome) in sessions.iter().zip(outcomes) {
            match outcome {
                Ok(info) => report.snapshots.push(info),
                Err(reason) => report.failed.push((session.session_id, reason)),
            }
        }
        tracing::info!(allocation = %id, node = %report.node_id, dir = %report.dir, snapshots = report.snapshots.len(), failed = report.failed.len(), ?after, "allocation checkpointed");
        Ok(report)
    }

    /// Replaces allocation `target`'s rpc-server with a fresh process on the same addresses, its
    /// apps carried over (see [`NodeManagerControl::restart_server`]).
    ///
    /// [`NodeManagerControl::restart_server`]: flyt_protocol::control::node::NodeManagerControl::restart_server
    pub(super) async fn restart_server(self: Arc<Self>, target: String, timeout_ms: u64) -> Result<RestartReport, ControlError> {
        let (id, vm_ip) = self.find_target(&target).await?;
        let vm_lock = self.vm_lock(&vm_ip);
        let _one_at_a_time = vm_lock.lock().await;
        self.settle_before_admin_step(&id).await?;
        let node_id = {
            let model = self.model.lock().await;
            let allocation = running_on_one_node(&model, &id, &target, "restarting its servers")?;
            if let Some(pending) = &allocation.pending_move {
                return Err(ControlError::Invalid(format!(
                    "allocation {id} is moving to {}; try again once the move is over",
                    pending.to_node
                )));
            }
            allocation.node_id.clone()
        };
        let deadline = rpc::deadline(MOVE_CALL_TIMEOUT + Duration::from_millis(timeout_ms));
        let call_id = id.clone();
        let mut report = self.node_call(&node_id, |node| async move { node.restart_server(deadline, call_id, timeout_ms).await }).await?;
        report.node_id.clone_from(&node_id);
        let mut model = self.model.lock().await;
        self.replaced_pids.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id.clone(), report.old_pid);
        if let Some(mut allocation) = model.allocations.get(&id).cloned() {
            allocation.pid = report.new_pid;
            allocation.addresses.clone_from(&report.addresses);
            // The new server's metrics port is its own, and its apps are on their way back to
            // it: the next report names the one and counts the others.
            allocation.metrics = None;
            allocation.sessions = 0;
            self.store.put_allocation(&allocation).await.map_err(store_error)?;
            model.allocations.insert(id.clone(), allocation);
        }
        tracing::info!(allocation = %id, node = %node_id, old_pid = report.old_pid, pid = report.new_pid, sessions = report.sessions.len(), "rpc-server restarted with its apps");
        Ok(report)
    }
}

/// Allocation `id` (asked for as `target`), running, for an admin step (`step`, as the error
/// names it) that pauses its apps' sessions: only on one node, until every node's sessions can
/// pause together.
fn running_on_one_node<'a>(model: &'a Model, id: &str, target: &str, step: &str) -> Result<&'a AllocationRecord, ControlError> {
    let allocation = model.running(id, target)?;
    if allocation.is_spread() {
        return Err(ControlError::Invalid(format!(
            "allocation {id} is spread over nodes {} (--spread): {step} is not supported yet (its apps' sessions on every node would have to pause together)",
            super::node_list(allocation)
        )));
    }
    Ok(allocation)
}
