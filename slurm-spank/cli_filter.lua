-- Flyt's cli_filter for Slurm (CliFilterPlugins=cli_filter/lua; this file as cli_filter.lua
-- beside slurm.conf): a job asking for --flyt-gpus=N also asks for N of the cluster's `flyt`
-- licenses, so it waits in the queue (reason: Licenses) while Flyt has no free GPU for it,
-- instead of starting and failing. `flytctl slurm sync` keeps the licenses' count in step with
-- the cluster manager. Merge these functions into an existing cli_filter.lua if the site has one.

-- The value of the flyt plugin's --flyt-gpus, or nil.
local function flyt_gpus(options)
    local spank = options["spank"]
    local flyt = spank and spank["flyt"]
    local value = flyt and flyt["flyt-gpus"]
    if value == nil or value == "" or value == "set" then
        return nil
    end
    return value
end

function slurm_cli_setup_defaults(options, early_pass)
    return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
    local value = flyt_gpus(options)
    if value == nil then
        return slurm.SUCCESS
    end
    -- A step of a job that exists: the job holds its licenses already.
    if options["type"] == "srun" and os.getenv("SLURM_JOB_ID") ~= nil then
        return slurm.SUCCESS
    end
    local count = tonumber(string.match(value, "^%s*(%d+)"))
    if count == nil or count < 1 then
        slurm.log_error("flyt: --flyt-gpus=%s: expected N[,sms=S][,memory=M]", value)
        return slurm.ERROR
    end
    local wanted = "flyt:" .. count
    local licenses = options["licenses"]
    if licenses == nil or licenses == "" then
        options["licenses"] = wanted
    elseif not string.find(licenses, "flyt[:=]") then
        options["licenses"] = licenses .. "," .. wanted
    end
    return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
    return slurm.SUCCESS
end
