//! `serve`: open the state, bind the socket, serve, recover, report ready; on SIGTERM stop
//! accepting, let in-flight calls finish within the grace period, remove the socket. SIGHUP is
//! ignored (see `ignore_hangups`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use ebs_store::Store;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::StreamExt;

use crate::cli::ServeArgs;
use crate::grpc;
use crate::health::{self, Health};
use crate::node::{self, AgentCtx};
use crate::nodeinfo;
use crate::settings::BackendKind;
use ebs_node_backends::ebs::{EbsBackend, EbsConfig};
use ebs_node_backends::loopback::{LoopBackend, LoopController, TOPOLOGY_KEY};
use ebs_node_backends::nodeinfo::{NodeInfo, NodeInfoSource, hostname};
use ebs_node_core::node::backend::Backend;
use ebs_node_core::request::{FsType, Roots};
use ebs_node_host::fstools::FsTools;

/// Start-up failures: the message is printed and the agent exits with this code.
pub struct Fatal {
    pub code: i32,
    pub message: String,
}

fn fatal(message: impl Into<String>) -> Fatal {
    Fatal {
        code: 1,
        message: message.into(),
    }
}

/// Where orchestrators put staging and target paths. (`/csi` is not one: Kubernetes and Nomad
/// mount the plugin's socket directory there.)
pub const DEFAULT_PREFIXES: &[&str] = &[
    "/var/lib/kubelet",
    "/var/lib/nomad",
    "/var/lib/mesos",
    "/local/csi",
];

use crate::settings::STATE_FILE;

/// Opens the state directory and file; an unwritable directory or a corrupt file stops here.
pub fn open_state(state_dir: &std::path::Path) -> Result<Store, Fatal> {
    use ebs_node_host::private;
    // What an older agent, a packaging step or an operator left readable to others first (one
    // log line each), then whatever is missing is created private.
    private::tighten_state_dir(state_dir).map_err(|e| {
        fatal(format!(
            "state directory {}: cannot check its permissions: {e}",
            state_dir.display()
        ))
    })?;
    private::ensure_dir(state_dir).map_err(|e| {
        fatal(format!(
            "state directory {} cannot be created: {e}",
            state_dir.display()
        ))
    })?;
    let probe = state_dir.join(".write-test");
    private::open_file(&probe, std::fs::OpenOptions::new().write(true).create(true))
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| {
            fatal(format!(
                "state directory {} is not writable: {e}",
                state_dir.display()
            ))
        })?;
    let path = state_dir.join(STATE_FILE);
    let store = Store::open(&path).map_err(|e| fatal(e.to_string()))?;
    // redb creates the file with the umask's mode; the directory kept others out meanwhile.
    private::restrict_file(&path).map_err(|e| fatal(format!("{}: {e}", path.display())))?;
    Ok(store)
}

/// Where staging and target paths may lie: the flag's list or the orchestrators' defaults. The
/// state directory is none of them; only v0.1's internal staging directory inside it is.
pub fn allowed_prefixes(args: &ServeArgs) -> Vec<PathBuf> {
    let mut allowed: Vec<PathBuf> = if args.allowed_path_prefixes.is_empty() {
        DEFAULT_PREFIXES.iter().map(PathBuf::from).collect()
    } else {
        args.allowed_path_prefixes.clone()
    };
    if args
        .csi_versions
        .contains(&crate::settings::CsiVersion::V01)
    {
        allowed.push(absolute(&args.state_dir).join(grpc::v01::node::STAGING_DIR));
    }
    allowed
}

/// The agent's own directories, never staging or target paths: the state directory and the
/// sockets' directories.
pub fn reserved_dirs(args: &ServeArgs) -> Vec<PathBuf> {
    let mut reserved = vec![absolute(&args.state_dir)];
    for ep in std::iter::once(&args.endpoint).chain(args.csi_addons_endpoint.iter()) {
        if let Some(dir) = ep.path().parent() {
            reserved.push(absolute(dir));
        }
    }
    reserved
}

fn absolute(p: &std::path::Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The loop controller's own files: re-attach them and thaw what a crashed snapshot froze. A
/// failure leaves those volumes detached (their calls say why), never the agent down; the thaw
/// (which opens mount points) is waited for a bounded time.
async fn loop_controller_recovery(c: Arc<LoopController>) {
    let attach = Arc::clone(&c);
    match tokio::task::spawn_blocking(move || attach.reattach_all()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::error!(error = %e, "recovery: loop volume files could not all be re-attached")
        }
        Err(e) => tracing::error!(error = %e, "recovery: re-attaching loop volume files failed"),
    }
    let thaw = tokio::task::spawn_blocking(move || c.thaw_attached());
    match tokio::time::timeout(node::recovery::VOLUME_WAIT, thaw).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => {
            tracing::error!(error = %e, "recovery: frozen filesystems could not be checked")
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "recovery: checking for frozen filesystems failed")
        }
        Err(_) => tracing::error!(
            "recovery: checking for frozen filesystems did not finish in time (a mount point below a dead mount?); going on"
        ),
    }
}

/// SIGHUP is logged and ignored, from the start of `serve` (start-up recovery included). It
/// reaches a daemon as a "reload" (an `ExecReload=kill -HUP`, Nomad's `change_signal` for a
/// re-rendered template, an operator's habit of reopening logs) or because the terminal or shell
/// that started it went away (no nohup). The agent has nothing to reload (its configuration is
/// its flags, read once; it logs to stderr), and none of these means "stop serving this node's
/// volumes": a node plugin that goes away leaves the orchestrator's calls failing until someone
/// restarts it. Draining would be that same outage, only tidier; the default action was worse
/// still (death mid-call: no drain, the socket file left). SIGTERM and SIGINT stop the agent.
fn ignore_hangups() -> Result<(), Fatal> {
    let mut hangups = signal(SignalKind::hangup()).map_err(|e| fatal(e.to_string()))?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::warn!(
                "SIGHUP ignored: nothing to reload, and a closed terminal does not stop the agent; stop it with SIGTERM"
            );
        }
    });
    Ok(())
}

pub async fn serve(args: ServeArgs) -> Result<(), Fatal> {
    ignore_hangups()?;
    let upstream = crate::upstream::from_args(&args.upstream, args.backend, args.mode)
        .map_err(|message| Fatal { code: 2, message })?;
    let fds = crate::fd_budget::raise_nofile_limit();
    grpc::versions::check(&args.csi_versions).map_err(|message| Fatal { code: 2, message })?;
    let roots = Arc::new(Roots::new(allowed_prefixes(&args), reserved_dirs(&args)));
    let store = Arc::new(open_state(&args.state_dir)?);
    crate::test_hooks::apply(&args.test_hooks);
    let fstools = FsTools::detect().with_legacy_xfs(args.legacy_xfs);
    for fs in FsType::ALL {
        if let Err(why) = fstools.supports(fs) {
            tracing::warn!(%fs, %why, "filesystem disabled: volumes that ask for it will be refused");
        }
    }
    let health = Arc::new(Health::default());
    health.watch_store(Arc::clone(&store));
    // In a pod with a service account: the startup taint, in the background (never waited for).
    crate::kube_duties::spawn_taint_removal(&args);
    if args.mode.serves_node() {
        health.set_problems(health::node_problems(&fstools));
    }

    let (backend, loop_controller, info): (Arc<dyn Backend>, _, _) = match args.backend {
        BackendKind::Loop => {
            let node_id = args.node_id.clone().unwrap_or_else(hostname);
            if node_id.len() > 256 {
                return Err(fatal("--node-id must be at most 256 bytes"));
            }
            ebs_node_backends::loopback::stacked::check_state_dir(&args.state_dir)
                .map_err(|e| fatal(e.to_string()))?;
            // The loop node's attach limit: --volume-attach-limit, none by default (loop devices
            // are allocated on demand); ControllerPublishVolume honours what NodeGetInfo says.
            let limit = u32::try_from(args.volume_attach_limit).unwrap_or(0);
            let info = Arc::new(NodeInfoSource::known(NodeInfo {
                node_id: node_id.clone(),
                max_volumes: i64::from(limit),
                topology: HashMap::from([(TOPOLOGY_KEY.to_string(), node_id.clone())]),
            }));
            let controller = Arc::new(LoopController::new(
                Arc::clone(&store),
                &args.state_dir,
                node_id,
                limit,
            ));
            (
                Arc::new(LoopBackend::new(Arc::clone(&store), &args.state_dir)) as Arc<dyn Backend>,
                Some(controller),
                info,
            )
        }
        BackendKind::Ebs => {
            // Node identity: flags, DMI, instance metadata, looked up in the background; a
            // missing identity is a Probe problem with a hint, never a crash.
            let info = Arc::new(NodeInfoSource::missing(
                nodeinfo::sources::LOOKING_UP.into(),
            ));
            if args.mode.serves_node() {
                let cfg = nodeinfo::sources::config_from_args(&args, &store).map_err(fatal)?;
                nodeinfo::sources::spawn(cfg, Arc::clone(&info), Arc::clone(&health));
            }
            let backend = EbsBackend::new(&EbsConfig {
                sys_root: args.sysfs_root.clone(),
                dev_root: args.dev_root.clone(),
                model: args.ebs_model.clone(),
                allow_unverified: args.allow_unverified_devices,
            });
            (Arc::new(backend) as Arc<dyn Backend>, None, info)
        }
    };

    // Node-local handles (`local-ebs://`) are served the same way whatever the backend.
    let backend: Arc<dyn Backend> = Arc::new(ebs_node_backends::local::WithLocalVolumes::new(
        backend,
        Arc::clone(&store),
    ));
    let attention = Arc::new(node::attention::Attention::new(args.attention_retry));
    let ctx = Arc::new(
        AgentCtx::new(
            Arc::clone(&store),
            Arc::clone(&backend),
            Arc::new(ebs_node_host::real_host::RealHost { fstools }),
            (*roots).clone(),
            Arc::new(node::AgentObserver {
                crash_after: crate::test_hooks::CrashPoint::from_args(&args.test_hooks),
            }),
            Arc::clone(&health),
            Arc::clone(&attention),
        )
        .map_err(|e| fatal(format!("this agent's instance id: {e}")))?,
    );
    // The loop controller's attach and the node's doors take a device under one lock, and
    // the devices it attaches carry this agent's tag.
    if let Some(c) = &loop_controller {
        c.join_node(ctx.device_locks.clone(), ctx.agent_tag.clone());
    }

    // Before the CSI socket, so a busy metrics port leaves no socket behind.
    if let Some(addr) = args.metrics_address {
        let metrics = crate::metrics::bind(addr)
            .await
            .map_err(|e| fatal(format!("--metrics-address {addr}: {e}")))?;
        crate::metrics::spawn(
            metrics,
            Arc::new(crate::metrics::Sources {
                store: Arc::clone(&store),
                locks: ctx.locks.clone(),
                health: Arc::clone(&health),
                attention: Arc::clone(&attention),
                ebs_stats: crate::metrics::ebs::from_serve_args(&args, &info),
            }),
            fds.metrics_connections,
        );
        tracing::info!(%addr, "metrics on http://{addr}/metrics");
    }
    let listener = args.endpoint.bind().map_err(fatal)?;
    tracing::info!(endpoint = %args.endpoint, mode = ?args.mode, backend = ?args.backend,
        state_dir = %args.state_dir.display(), version = env!("CARGO_PKG_VERSION"), "serving");
    // What a seccomp filter (systemd's unit, a container profile) denies is said once, now.
    ebs_node_host::sandbox::survey();
    // Read-only binds without the new mount API are made in a private place first (see
    // host/mount/private_bind.rs); made now, leftovers of a crash detached, where they will be needed.
    ebs_node_host::mount::private_bind::set_dir(args.state_dir.join("binds"));
    match ebs_node_host::mount::private_bind::sweep() {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            detached = n,
            "recovery: detached the private binds a crash left in the state directory"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "the private place for read-only binds could not be read")
        }
    }
    if !ebs_node_host::sandbox::mount_api_usable()
        && let Err(e) = ebs_node_host::mount::private_bind::prepare()
    {
        tracing::warn!(error = %e, "the private place for read-only binds cannot be made; read-only publishes will fail");
    }

    let identity = grpc::identity::IdentityService {
        driver_name: args.driver_name.clone(),
        manifest: HashMap::from([
            (
                "backend".to_string(),
                format!("{:?}", args.backend).to_lowercase(),
            ),
            (
                "mode".to_string(),
                format!("{:?}", args.mode).to_lowercase(),
            ),
        ]),
        health: Arc::clone(&health),
    };
    // CSI-Addons: a second socket with the CSI one's bind rules and lifetime.
    let addons = match &args.csi_addons_endpoint {
        Some(ep) => {
            let addons_identity = grpc::addons::AddonsIdentity {
                driver_name: args.driver_name.clone(),
                manifest: identity.manifest.clone(),
                health: Arc::clone(&health),
                serves_node: args.mode.serves_node(),
                serves_controller: args.mode.serves_controller() && loop_controller.is_some(),
            };
            let node = args
                .mode
                .serves_node()
                .then(|| grpc::addons::ReclaimSpaceNodeService {
                    ctx: Arc::clone(&ctx),
                    roots: Arc::clone(&roots),
                });
            let spawned = if ep == &args.endpoint {
                Err("--csi-addons-endpoint must differ from --endpoint".to_string())
            } else {
                grpc::addons::spawn(ep, addons_identity, node, fds.grpc_connections)
            };
            Some(spawned.map_err(|e| {
                args.endpoint.remove();
                fatal(e)
            })?)
        }
        None => None,
    };
    let router = crate::connections::server().add_service(
        ebs_proto::admin::admin_server::AdminServer::new(grpc::admin::AdminService {
            store: Arc::clone(&store),
            state_dir: args.state_dir.clone(),
            allowed: roots.allowed.clone(),
            backend: args.backend,
            mode: args.mode,
            node: Arc::clone(&ctx),
        }),
    );
    let services = grpc::versions::Services {
        identity: Arc::new(identity),
        node: args.mode.serves_node().then(|| {
            Arc::new(grpc::node::NodeService {
                ctx: Arc::clone(&ctx),
                roots: Arc::clone(&roots),
                info,
                device_wait: args.device_wait,
                stats_in_flight: Default::default(),
            })
        }),
        loop_controller: loop_controller
            .as_ref()
            .filter(|_| args.mode.serves_controller())
            .map(|c| {
                Arc::new(grpc::controller::LoopControllerService {
                    controller: Arc::clone(c),
                    locks: ctx.locks.clone(),
                })
            }),
        shim: upstream.map(|upstream| {
            let shim = Arc::new(grpc::shim::ControllerShim::new(upstream));
            shim.check_at_start();
            shim
        }),
    };
    let router =
        grpc::versions::add_services(router, &args.csi_versions, services, &args.state_dir);

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Every accepted connection (at most the descriptor budget's share at once, none holding a
    // slot idly while another waits: see connections) gets the :authority fix (authority_fix).
    let incoming = crate::connections::incoming(listener, fds.grpc_connections)
        .map(|conn| conn.map(crate::authority_fix::AuthorityFix::new));
    let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = stop_rx.await;
    }));

    // Start-up recovery runs while Probe already answers ready=false. It never stops the agent
    // over one volume: a volume whose records cannot be checked in time is marked as needing
    // attention, and the rest gets ready.
    let started = std::time::Instant::now();
    if let Some(c) = loop_controller.clone() {
        loop_controller_recovery(c).await;
    }
    let wait = node::recovery::VOLUME_WAIT;
    let report = node::recovery::recover(&ctx, wait)
        .await
        .map_err(|e| fatal(format!("start-up recovery failed: {e}")))?;
    tracing::info!(
        volumes = report.volumes,
        dropped_stagings = report.dropped_stagings,
        dropped_publications = report.dropped_publications,
        needing_attention = report.needing_attention,
        pruned = report.pruned,
        ms = started.elapsed().as_millis() as u64,
        "start-up recovery done; ready"
    );
    // Before READY=1: a SIGTERM that follows it at once (systemd stopping a unit that just
    // started) must find the handler, not the default action that kills without draining
    // (seen once in a test run: READY and a watchdog ping, then SIGTERM, and no STOPPING=1).
    let mut term = signal(SignalKind::terminate()).map_err(|e| fatal(e.to_string()))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| fatal(e.to_string()))?;
    node::attention::spawn_retries(Arc::clone(&ctx), wait);
    health.set_ready();
    crate::notify::ready();
    crate::notify::spawn_watchdog();
    ebs_node_host::malloc::spawn_periodic_release(std::time::Duration::from_secs(10));

    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
    crate::notify::stopping();
    let _ = stop_tx.send(());
    let addons_drained = async {
        if let Some(a) = addons {
            a.shutdown(args.shutdown_grace).await;
        }
    };
    let (drained, ()) = tokio::join!(
        tokio::time::timeout(args.shutdown_grace, server),
        addons_drained
    );
    match drained {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::error!(error = %e, "server error while draining"),
        Ok(Err(e)) => tracing::error!(error = %e, "server task failed"),
        Err(_) => {
            tracing::warn!(grace = ?args.shutdown_grace, "grace period over; exiting with calls in flight")
        }
    }
    // Lazy records (a finished call's "done" line) are on disk before the process goes, so a
    // clean stop leaves start-up recovery nothing to complete, and the boot log nothing to
    // replay: the file is left readable by an agent older than the log.
    if let Err(e) = store.close_cleanly() {
        tracing::warn!(error = %e, "could not make the last journal records durable at stop");
    }
    args.endpoint.remove();
    tracing::info!("stopped");
    Ok(())
}
