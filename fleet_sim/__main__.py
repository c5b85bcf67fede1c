from fleet_sim.cli import main

main()
